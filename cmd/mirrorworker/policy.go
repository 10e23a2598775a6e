package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/bytesize"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/policy"
)

// policyCASTries is how often `policy set` re-reads and re-applies its edit
// when another edit came first (without --revision).
const policyCASTries = 5

func policyUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: mirrorworker policy set    (--authority HOST:PORT | --group NAME | --default) [--floor D] [--max-in-flight N]")
	fmt.Fprintln(w, "                                 [--bandwidth RATE] [--first-step D] [--decay N]")
	fmt.Fprintln(w, "                                 [--members LIST | --add-members LIST | --remove-members LIST]")
	fmt.Fprintln(w, "                                 [--for D | --until TIME] [--reason TEXT] [--replace] [--revision N]")
	fmt.Fprintln(w, "       mirrorworker policy show   (--authority HOST:PORT | --group NAME | --default) [--json]")
	fmt.Fprintln(w, "       mirrorworker policy list   [--json]")
	fmt.Fprintln(w, "       mirrorworker policy delete (--authority HOST:PORT | --group NAME | --default) [--revision N]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Changes the politeness of a running cluster: every pod watches bucket "+policy.Bucket+" and applies")
	fmt.Fprintln(w, "a change from its next request, within a second. An authority's key wins over its entry in the")
	fmt.Fprintln(w, "pods' --policy file, which wins over the default key, which wins over the file's default and")
	fmt.Fprintln(w, "--floor/--max-in-flight. A group (--group NAME --members a.example:443,*.example.org) paces")
	fmt.Fprintln(w, "its members as one origin, by its own limits, on one pod. Edits are compare-and-set: none is")
	fmt.Fprintln(w, "lost to a concurrent one.")
	fmt.Fprintln(w, "Run 'mirrorworker policy <command> -h' for its flags.")
}

// cmdPolicy is `mirrorworker policy set|show|list|delete`.
func cmdPolicy(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		policyUsage(stderr)
		if len(args) == 0 {
			return usageError{"policy: missing command: set, show, list or delete"}
		}
		return nil
	}
	o, run, err := policyCommand(ctx, args[0], args[1:], getenv, stdout, stderr)
	if err != nil {
		return err
	}
	js, closeConn, err := o.connect(ctx, "KV_"+policy.Bucket)
	if err != nil {
		return err
	}
	defer closeConn()
	kctx, cancel := context.WithTimeout(ctx, o.timeout())
	defer cancel()
	kv, err := policy.EnsureBucket(kctx, js, 0)
	if err != nil {
		return err
	}
	return run(kv)
}

// policyKey parses a policy command's flags and returns the key it edits
// (the authority, or policy.DefaultKey with --default; for list, the
// authority it is narrowed to, or "").
func policyKey(o *opFlags, fs *flag.FlagSet, sub string, def *bool, group *string, args []string, getenv func(string) string, stderr io.Writer, usage ...string) (string, error) {
	auth, err := o.parse(fs, args, getenv, stderr, true, usage...)
	if err != nil || sub == "list" {
		return auth, err
	}
	n := 0
	for _, given := range []bool{*def, auth != "", *group != ""} {
		if given {
			n++
		}
	}
	switch {
	case n > 1:
		return "", usageError{"policy " + sub + ": give one of --authority, --group and --default"}
	case *def:
		return policy.DefaultKey, nil
	case *group != "":
		if err := pacer.CheckGroupName(*group); err != nil {
			return "", usageError{"policy " + sub + ": --group: " + err.Error()}
		}
		return pacer.GroupPrefix + *group, nil
	case auth == "":
		return "", usageError{"policy " + sub + ": --authority HOST:PORT, --group NAME or --default is required"}
	}
	return auth, nil
}

// policyCommand parses the flags of one policy command and returns what
// it does to the bucket.
func policyCommand(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) (*opFlags, func(jetstream.KeyValue) error, error) {
	o := &opFlags{}
	fs := newFlagSet("policy "+sub, stderr)
	def, group := false, ""
	if sub != "list" {
		o.register(fs, "the authority: host:port, or a URL (https://h/x means h:443)")
		fs.BoolVar(&def, "default", false, "the default key: every authority without a key of its own or an entry in the --policy file")
		fs.StringVar(&group, "group", "", "a politeness group: its members are paced as one origin, by the group's limits")
	} else {
		o.register(fs, "list only this authority's key (host:port, or a URL)")
	}
	var auth string
	parse := func(usage ...string) (err error) {
		auth, err = policyKey(o, fs, sub, &def, &group, args, getenv, stderr, usage...)
		return err
	}
	switch sub {
	case "set":
		var f policySetFlags
		f.register(fs)
		if err := parse("usage: mirrorworker policy set (--authority HOST:PORT | --group NAME | --default) [--floor D] [--max-in-flight N] [--bandwidth RATE] [--first-step D] [--decay N] [--members LIST | --add-members LIST | --remove-members LIST] [--for D | --until TIME] [--reason TEXT] [--replace] [--revision N]",
			"Sets the floor, the in-flight cap, the bandwidth cap and/or the convergence after a throttle of one authority, group or the default on every pod,",
			"and a group's members. Fields not given keep the key's current value (--replace: the layers below). --for/--until",
			"make it temporary: at that instant the pods drop it by themselves."); err != nil {
			return nil, nil, err
		}
		given := explicitFlags(fs, getenv)
		if err := f.checkMembers(given, strings.HasPrefix(auth, pacer.GroupPrefix)); err != nil {
			return nil, nil, err
		}
		if err := f.check(given, time.Now()); err != nil {
			return nil, nil, err
		}
		return o, func(kv jetstream.KeyValue) error { return policySet(ctx, kv, auth, &f, given, o.timeout(), stdout) }, nil
	case "show":
		asJSON := fs.Bool("json", false, "print the value as JSON")
		if err := parse("usage: mirrorworker policy show (--authority HOST:PORT | --group NAME | --default) [--json]",
			"Shows one key of "+policy.Bucket+": its limits, until, reason and revision."); err != nil {
			return nil, nil, err
		}
		return o, func(kv jetstream.KeyValue) error { return policyShow(ctx, kv, auth, *asJSON, o.timeout(), stdout) }, nil
	case "list":
		asJSON := fs.Bool("json", false, "print JSON")
		if err := parse("usage: mirrorworker policy list [--json]",
			"Lists every key of "+policy.Bucket+", expired overrides marked."); err != nil {
			return nil, nil, err
		}
		return o, func(kv jetstream.KeyValue) error { return policyList(ctx, kv, auth, *asJSON, o.timeout(), stdout) }, nil
	case "delete":
		rev := fs.Uint64("revision", 0, "delete only if the key is still at this revision (from 'policy show')")
		if err := parse("usage: mirrorworker policy delete (--authority HOST:PORT | --group NAME | --default) [--revision N]",
			"Deletes one key: the authority gets the policy below it again (its --policy file entry or the default);",
			"a group's members leave it (unless the --policy file has the group)."); err != nil {
			return nil, nil, err
		}
		return o, func(kv jetstream.KeyValue) error { return policyDelete(ctx, kv, auth, *rev, o.timeout(), stdout) }, nil
	}
	policyUsage(stderr)
	return nil, nil, usageError{fmt.Sprintf("policy: unknown command %q: want set, show, list or delete", sub)}
}

type policySetFlags struct {
	floor       time.Duration
	maxInFlight int
	bandwidth   rateFlag
	firstStep   time.Duration
	decay       int
	forD        time.Duration
	until       string
	reason      string
	replace     bool
	revision    uint64
	untilAt     time.Time
	// A group's members: the whole list, or members added or removed.
	members, addMembers, removeMembers string
}

func (f *policySetFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.floor, "floor", 0, "minimum spacing between requests to the authority or group as it receives them, 0 to "+pacer.MaxPolicyFloor.String())
	fs.IntVar(&f.maxInFlight, "max-in-flight", 0, fmt.Sprintf("cap of requests in flight to the authority, 1 to %d", pacer.MaxPolicyInFlight))
	fs.Var(&f.bandwidth, "bandwidth", "cap of the authority's body transfers together, a `rate` in bytes per second (1MiB/s, 500KB/s, or a plain number; at least "+bytesize.FormatRate(pacer.MinPolicyBandwidth)+"), enforced by the pod that serves it; 0: no cap")
	fs.DurationVar(&f.firstStep, "first-step", 0, fmt.Sprintf("the interval's first step after a throttling answer (default %s), above 0, at most %s", pacer.FirstStep, pacer.MaxInterval))
	fs.IntVar(&f.decay, "decay", 0, fmt.Sprintf("answers for the interval to halve once back at the pace learned from the origin (default %d), 1 to %d: lower probes the origin's limit faster, with more rejections", pacer.DefaultDecay, pacer.MaxDecay))
	fs.DurationVar(&f.forD, "for", 0, "temporary: the pods drop the key this long from now")
	fs.StringVar(&f.until, "until", "", "temporary: the pods drop the key at this instant (RFC 3339, e.g. 2026-12-01T18:00:00Z)")
	fs.StringVar(&f.reason, "reason", "", "why, for the logs and 'policy list'")
	fs.BoolVar(&f.replace, "replace", false, "write only the fields given (the others come from the layers below), instead of keeping the key's current ones")
	fs.StringVar(&f.members, "members", "", "a group's members, comma-separated: host:port authorities and *.DOMAIN or *.DOMAIN:PORT patterns (replaces the list)")
	fs.StringVar(&f.addMembers, "add-members", "", "members to add to the group's list (comma-separated)")
	fs.StringVar(&f.removeMembers, "remove-members", "", "members to remove from the group's list (comma-separated)")
	fs.Uint64Var(&f.revision, "revision", 0, "write only if the key is still at this revision (from 'policy show'); without it a concurrent edit is re-read and this one re-applied on top")
}

func (f *policySetFlags) check(given map[string]bool, now time.Time) error {
	switch {
	case given["for"] && given["until"]:
		return usageError{"policy set: give --for or --until, not both"}
	case given["for"] && f.forD <= 0:
		return usageError{"policy set: --for must be positive (e.g. --for 2h)"}
	case given["for"]:
		f.untilAt = now.Add(f.forD)
	case given["until"]:
		t, err := time.Parse(time.RFC3339, f.until)
		if err != nil {
			return usageError{fmt.Sprintf("policy set: --until %q is not an RFC 3339 time such as 2026-12-01T18:00:00Z", f.until)}
		}
		if !t.After(now) {
			return usageError{fmt.Sprintf("policy set: --until %s is not in the future", f.until)}
		}
		f.untilAt = t
	}
	limits := given["floor"] || given["max-in-flight"] || given["bandwidth"] || given["first-step"] || given["decay"] ||
		given["members"] || given["add-members"] || given["remove-members"]
	if !limits && (f.replace || !given["for"] && !given["until"] && !given["reason"]) {
		return usageError{"policy set: give --floor, --max-in-flight, --bandwidth, --first-step, --decay and/or a group's members"}
	}
	return nil
}

// checkMembers refuses members for a key that is not a group's, and two
// ways of giving them at once.
func (f *policySetFlags) checkMembers(given map[string]bool, group bool) error {
	some := given["members"] || given["add-members"] || given["remove-members"]
	switch {
	case some && !group:
		return usageError{"policy set: --members, --add-members and --remove-members are a group's (--group NAME)"}
	case given["members"] && (given["add-members"] || given["remove-members"]):
		return usageError{"policy set: give --members (the whole list) or --add-members/--remove-members, not both"}
	}
	return nil
}

// membersOf is the group's member list after the flags: --members replaces
// cur, --add-members and --remove-members edit it.
func (f *policySetFlags) membersOf(cur []string, given map[string]bool) ([]string, error) {
	split := func(s string) []string {
		var out []string
		for _, m := range strings.Split(s, ",") {
			if m = strings.TrimSpace(m); m != "" {
				out = append(out, m)
			}
		}
		return out
	}
	if given["members"] {
		cur = split(f.members)
	}
	cur = append(slices.Clone(cur), split(f.addMembers)...)
	if given["remove-members"] {
		drop := map[string]bool{}
		for _, m := range split(f.removeMembers) {
			nm, err := pacer.NormalizeMember(m)
			if err != nil {
				return nil, usageError{"policy set: --remove-members: " + err.Error()}
			}
			drop[nm] = true
		}
		keep := cur[:0:0]
		for _, m := range cur {
			if nm, err := pacer.NormalizeMember(m); err != nil || !drop[nm] {
				keep = append(keep, m)
			}
		}
		cur = keep
	}
	if len(cur) == 0 {
		return nil, usageError{"policy set: a group needs at least one member (delete the group with 'policy delete --group')"}
	}
	g, err := pacer.NewGroup(cur)
	if err != nil {
		return nil, usageError{"policy set: " + err.Error()}
	}
	return g.Members, nil
}

// value is the key's new value: the current one (unless --replace) with
// the flags given.
func (f *policySetFlags) value(cur *policy.Value, given map[string]bool, now time.Time) (policy.Value, error) {
	var v policy.Value
	if cur != nil && !f.replace {
		v = *cur
	}
	if given["floor"] {
		d := f.floor
		v.Floor = &d
	}
	if given["max-in-flight"] {
		n := f.maxInFlight
		v.MaxInFlight = &n
	}
	if given["bandwidth"] {
		r := int64(f.bandwidth)
		v.Bandwidth = &r
	}
	if given["first-step"] {
		d := f.firstStep
		v.FirstStep = &d
	}
	if given["decay"] {
		n := f.decay
		v.Decay = &n
	}
	if !f.untilAt.IsZero() {
		v.Until = f.untilAt
	}
	if given["reason"] {
		v.Reason = f.reason
	}
	if given["members"] || given["add-members"] || given["remove-members"] {
		m, err := f.membersOf(v.Members, given)
		if err != nil {
			return v, err
		}
		v.Members = m
	}
	v.SetAt = now
	if err := v.Validate(); err != nil {
		return v, usageError{"policy set: " + strings.TrimPrefix(err.Error(), policy.ErrInvalid.Error()+": ")}
	}
	return v, nil
}

func policySet(ctx context.Context, kv jetstream.KeyValue, auth string, f *policySetFlags, given map[string]bool, timeout time.Duration, stdout io.Writer) error {
	key, err := policy.Key(auth)
	if err != nil {
		return err
	}
	for try := 1; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		cur, rev, err := policyGet(cctx, kv, key)
		if err != nil {
			cancel()
			return err
		}
		if given["revision"] && rev != f.revision {
			cancel()
			return fmt.Errorf("policy set: %s is at revision %d, not %d: someone changed it; 'mirrorworker policy show' it and retry", auth, rev, f.revision)
		}
		v, err := f.value(cur, given, time.Now())
		if err != nil {
			cancel()
			return err
		}
		data, err := json.Marshal(v)
		if err != nil {
			cancel()
			return err
		}
		var nrev uint64
		if rev == 0 {
			nrev, err = kv.Create(cctx, key, data)
		} else {
			nrev, err = kv.Update(cctx, key, data, rev)
		}
		cancel()
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "set %s: %s (revision %d)\n", auth, describeValue(v), nrev)
			return nil
		case !errors.Is(err, jetstream.ErrKeyExists):
			return fmt.Errorf("policy set: %w", err)
		case given["revision"]:
			return fmt.Errorf("policy set: %s changed after revision %d: 'mirrorworker policy show' it and retry", auth, f.revision)
		case try == policyCASTries:
			return fmt.Errorf("policy set: %s changed under this edit %d times in a row; retry", auth, try)
		}
	}
}

// policyGet returns the key's value and revision; nil and 0 when it does not
// exist (or was deleted).
func policyGet(ctx context.Context, kv jetstream.KeyValue, key string) (*policy.Value, uint64, error) {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("read %s %s: %w", policy.Bucket, key, err)
	}
	v, err := policy.ParseValue(e.Value())
	if err != nil {
		// Shown as it is, so that an operator can overwrite it.
		return nil, e.Revision(), nil
	}
	return &v, e.Revision(), nil
}

// describeBandwidth is a cap as the commands print it: "1MiB/s", or "none".
func describeBandwidth(n int64) string {
	if n == 0 {
		return "none"
	}
	return bytesize.FormatRate(n)
}

func describeValue(v policy.Value) string {
	var parts []string
	if v.Floor != nil {
		parts = append(parts, "floor "+v.Floor.String())
	}
	if v.MaxInFlight != nil {
		parts = append(parts, fmt.Sprintf("max in flight %d", *v.MaxInFlight))
	}
	if v.Bandwidth != nil {
		parts = append(parts, "bandwidth "+describeBandwidth(*v.Bandwidth))
	}
	if v.FirstStep != nil {
		parts = append(parts, "first step "+v.FirstStep.String())
	}
	if v.Decay != nil {
		parts = append(parts, fmt.Sprintf("decay %d", *v.Decay))
	}
	if !v.Until.IsZero() {
		parts = append(parts, "until "+v.Until.UTC().Format(time.RFC3339))
	}
	if v.Reason != "" {
		parts = append(parts, fmt.Sprintf("reason %q", v.Reason))
	}
	if len(v.Members) > 0 {
		parts = append(parts, "members "+strings.Join(v.Members, ","))
	}
	return strings.Join(parts, ", ")
}

// policyRow is one key in `policy show` and `policy list`.
type policyRow struct {
	Authority string       `json:"authority"` // "host:port", "group:NAME" or "default"
	Key       string       `json:"key"`
	Revision  uint64       `json:"revision"`
	Value     policy.Value `json:"value"`
	Expired   bool         `json:"expired"` // past its until: the pods ignore it
	Invalid   string       `json:"invalid,omitempty"`
}

func policyShow(ctx context.Context, kv jetstream.KeyValue, auth string, asJSON bool, timeout time.Duration, stdout io.Writer) error {
	key, err := policy.Key(auth)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	e, err := kv.Get(cctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return fmt.Errorf("policy show: %s has no key in %s: it has the pods' --policy file entry or the default", auth, policy.Bucket)
	}
	if err != nil {
		return fmt.Errorf("policy show: %w", err)
	}
	return printPolicyRows(stdout, []policyRow{policyRowOf(auth, e, time.Now())}, asJSON)
}

func policyRowOf(auth string, e jetstream.KeyValueEntry, now time.Time) policyRow {
	r := policyRow{Authority: auth, Key: e.Key(), Revision: e.Revision()}
	v, err := policy.ParseValue(e.Value())
	if err != nil {
		r.Invalid = err.Error()
		return r
	}
	r.Value, r.Expired = v, !v.Active(now)
	return r
}

func policyList(ctx context.Context, kv jetstream.KeyValue, only string, asJSON bool, timeout time.Duration, stdout io.Writer) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lister, err := kv.ListKeys(cctx)
	if err != nil {
		return fmt.Errorf("policy list: %w", err)
	}
	now := time.Now()
	var rows []policyRow
	for k := range lister.Keys() {
		e, err := kv.Get(cctx, k)
		if err != nil {
			continue // deleted meanwhile
		}
		auth, err := policy.ParseKey(k)
		if err != nil {
			auth = "?"
		}
		if only != "" && auth != only {
			continue
		}
		rows = append(rows, policyRowOf(auth, e, now))
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Key < rows[j].Key })
	return printPolicyRows(stdout, rows, asJSON)
}

func printPolicyRows(stdout io.Writer, rows []policyRow, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if rows == nil {
			rows = []policyRow{}
		}
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AUTHORITY\tFLOOR\tMAX IN FLIGHT\tBANDWIDTH\tUNTIL\tREASON\tREVISION\tMEMBERS")
	for _, r := range rows {
		if r.Invalid != "" {
			fmt.Fprintf(tw, "%s\t(invalid: %s)\t\t\t\t\t%d\n", r.Authority, r.Invalid, r.Revision)
			continue
		}
		floor, capN, bw, until := "-", "-", "-", "-"
		if r.Value.Bandwidth != nil {
			bw = describeBandwidth(*r.Value.Bandwidth)
		}
		if r.Value.Floor != nil {
			floor = r.Value.Floor.String()
		}
		if r.Value.FirstStep != nil {
			floor += ", first step " + r.Value.FirstStep.String()
		}
		if r.Value.Decay != nil {
			floor += fmt.Sprintf(", decay %d", *r.Value.Decay)
		}
		if r.Value.MaxInFlight != nil {
			capN = fmt.Sprint(*r.Value.MaxInFlight)
		}
		if !r.Value.Until.IsZero() {
			until = r.Value.Until.UTC().Format(time.RFC3339)
			if r.Expired {
				until += " (ended)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Authority, floor, capN, bw, until, r.Value.Reason, r.Revision, strings.Join(r.Value.Members, ","))
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no keys: every pod runs its --policy file and flags)\t\t\t\t\t\t")
	}
	return tw.Flush()
}

func policyDelete(ctx context.Context, kv jetstream.KeyValue, auth string, rev uint64, timeout time.Duration, stdout io.Writer) error {
	key, err := policy.Key(auth)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, cur, err := policyGet(cctx, kv, key); err != nil {
		return err
	} else if cur == 0 {
		return fmt.Errorf("policy delete: %s has no key in %s", auth, policy.Bucket)
	}
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	if err := kv.Delete(cctx, key, opts...); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("policy delete: %s changed after revision %d: 'mirrorworker policy show' it and retry", auth, rev)
		}
		return fmt.Errorf("policy delete: %w", err)
	}
	fmt.Fprintf(stdout, "deleted %s: the pods give it the policy below it again\n", auth)
	return nil
}
