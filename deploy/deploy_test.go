// Package deploy_test checks what ships under deploy/: the Kubernetes
// manifests (strictly decoded into the API types, and the kustomizations
// rendered), the Grafana dashboard and the alert rules (every PromQL
// expression parsed, every metric checked against the worker's own
// registry, deploy/metrics/names.txt), and the container image.
//
// It is a module of its own so that these heavy dependencies never reach
// the mirrorworker binary. `make test` runs it.
package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// workerMetrics is the set of metric names the worker registers.
func workerMetrics(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join("metrics", "names.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			names[l] = true
		}
	}
	if len(names) < 10 {
		t.Fatalf("metrics/names.txt lists %d names: regenerate it (see its header)", len(names))
	}
	return names
}

// exported reports whether a series name is exported: the metric itself
// or a histogram's or summary's _bucket, _sum or _count.
func exported(names map[string]bool, n string) bool {
	if names[n] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, suf); ok && names[b] {
			return true
		}
	}
	return false
}

// metricNames parses a PromQL expression and returns the metric names its
// selectors use.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out, nil
}

// oneNumber reports an expression that can return more than one series:
// a stat panel shows one number, and a stat of 32 partitions' values is
// 32 numbers. The outermost operation must aggregate without "by".
func oneNumber(expr string) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return err
	}
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			break
		}
		e = p.Expr
	}
	a, ok := e.(*parser.AggregateExpr)
	switch {
	case !ok:
		return errors.New("not an aggregation: one series per pod or per label set")
	case a.Op == parser.TOPK || a.Op == parser.BOTTOMK || a.Op == parser.COUNT_VALUES:
		return fmt.Errorf("%s returns several series", a.Op)
	case len(a.Grouping) > 0 || a.Without:
		return fmt.Errorf("grouped by %v: one number per group", a.Grouping)
	}
	return nil
}

// grafanaVars replaces the dashboard's variables by values PromQL accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", ".*", "${datasource}", "prom")

func TestDashboard(t *testing.T) {
	names := workerMetrics(t)
	b, err := os.ReadFile(filepath.Join("grafana", "mirrorworker.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title       string `json:"title"`
			Type        string `json:"type"`
			Description string `json:"description"`
			Targets     []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	titles := map[string]bool{}
	used := map[string]bool{}
	exprs := 0
	for _, p := range d.Panels {
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		// The on-call person reads what a panel means on the panel.
		if len(p.Description) < 40 {
			t.Errorf("panel %q has no description saying what it shows and what to do", p.Title)
		}
		// Versions is one number per version on purpose (a rollout).
		if p.Type == "stat" && p.Title != "Versions" {
			for _, tg := range p.Targets {
				if err := oneNumber(grafanaVars.Replace(tg.Expr)); err != nil {
					t.Errorf("stat panel %q: %q: %v", p.Title, tg.Expr, err)
				}
			}
		}
		for _, tg := range p.Targets {
			exprs++
			ms, err := metricNames(grafanaVars.Replace(tg.Expr))
			if err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, tg.Expr, err)
				continue
			}
			if len(ms) == 0 {
				t.Errorf("panel %q: %q names no metric", p.Title, tg.Expr)
			}
			for _, m := range ms {
				used[m] = true
				if !exported(names, m) {
					t.Errorf("panel %q uses %s, which the worker does not export", p.Title, m)
				}
			}
		}
	}
	for _, want := range []string{"Jobs by outcome", "Fetch latency (job duration)", "Bytes stored", "Pacer states", "Cooldowns",
		"In flight and held", "Deferred and parked backlog", "Consumer lag", "Dead letters by reason",
		"Parked jobs", "Parked jobs by origin", "Mirror target", "Consumer pending"} {
		if !titles[want] {
			t.Errorf("dashboard lacks the panel %q", want)
		}
	}
	// The gauges an operator acts on each have a panel.
	for _, m := range []string{"mirrorworker_parked_jobs", "mirrorworker_target_up", "mirrorworker_ready", "mirrorworker_nats_connected",
		"mirrorworker_consumer_pending", "mirrorworker_pacer_authorities", "mirrorworker_dead_letters_total"} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	t.Logf("%d panels, %d expressions checked against %d exported metrics", len(d.Panels), exprs, len(names))
}

func TestAlertRules(t *testing.T) {
	names := workerMetrics(t)
	path := filepath.Join("prometheus", "mirrorworker-alerts.yml")
	groups, errs := rulefmt.ParseFile(path, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s: %v", path, errors.Join(errs...))
	}
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			seen[r.Alert] = true
			if time.Duration(r.For) <= 0 {
				t.Errorf("%s has no for:", r.Alert)
			}
			if len(r.Annotations["runbook"]) < 200 {
				t.Errorf("%s: runbook annotation of %d characters, want a paragraph", r.Alert, len(r.Annotations["runbook"]))
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s has no summary", r.Alert)
			}
			ms, err := metricNames(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
			}
			for _, m := range ms {
				if !exported(names, m) {
					t.Errorf("%s uses %s, which the worker does not export", r.Alert, m)
				}
			}
		}
	}
	for _, want := range []string{"MirrorworkerDeadLetters", "MirrorworkerBudgetExhausted", "MirrorworkerStalled",
		"MirrorworkerNATSDisconnected", "MirrorworkerNotReady", "MirrorworkerOriginCoolingLong", "MirrorworkerConsumerLagGrowing"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// serviceMonitor holds the fields of monitoring.coreos.com/v1 ServiceMonitor
// the manifests use; strict decoding refuses any other. (The operator's Go
// types would pull in its whole module for one object.)
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// typed returns an empty API object for a kind.
func typed(kind string) any {
	switch kind {
	case "Deployment":
		return &appsv1.Deployment{}
	case "Service":
		return &corev1.Service{}
	case "ConfigMap":
		return &corev1.ConfigMap{}
	case "Secret":
		return &corev1.Secret{}
	case "PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "ServiceAccount":
		return &corev1.ServiceAccount{}
	case "Namespace":
		return &corev1.Namespace{}
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "ServiceMonitor":
		return &serviceMonitor{}
	}
	return nil
}

// decodeStrict decodes one YAML document into its API type, refusing
// unknown and duplicate fields.
func decodeStrict(doc []byte) (kind string, obj any, err error) {
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, err
	}
	obj = typed(tm.Kind)
	if obj == nil {
		return tm.Kind, nil, fmt.Errorf("kind %q (%s): no API type to check it against", tm.Kind, tm.APIVersion)
	}
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return tm.Kind, nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return tm.Kind, obj, nil
}

func yamlDocs(b []byte) ([][]byte, error) {
	var out [][]byte
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		doc, err := yaml.Marshal(&n)
		if err != nil {
			return nil, err
		}
		out = append(out, doc)
	}
}

// TestManifestsDecodeStrictly decodes every manifest file (kustomizations
// aside) into the Kubernetes API types.
func TestManifestsDecodeStrictly(t *testing.T) {
	var files []string
	filepath.WalkDir("kubernetes", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") && filepath.Base(p) != "kustomization.yaml" {
			files = append(files, p)
		}
		return err
	})
	if len(files) < 8 {
		t.Fatalf("found %d manifests under kubernetes/", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := yamlDocs(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, doc := range docs {
			if _, _, err := decodeStrict(doc); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
}

// render runs kustomize on dir and decodes every resource strictly.
func render(t *testing.T, dir string) map[string]any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out := map[string]any{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		kind, obj, err := decodeStrict(y)
		if err != nil {
			t.Errorf("%s rendered: %v", dir, err)
			continue
		}
		out[kind+"/"+r.GetName()] = obj
	}
	return out
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func TestKustomizeRender(t *testing.T) {
	for _, dir := range []string{"kubernetes/base", "kubernetes/overlays/external-nats", "kubernetes/overlays/s3"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			s3 := strings.HasSuffix(dir, "/s3")
			keys := make([]string, 0, len(objs))
			for k := range objs {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			t.Logf("rendered %v", keys)
			for _, want := range []string{"Deployment/mirrorworker", "Service/mirrorworker", "ServiceMonitor/mirrorworker",
				"PodDisruptionBudget/mirrorworker", "ConfigMap/mirrorworker-policy", "Secret/mirrorworker-nats", "Secret/mirrorworker-credentials",
				"PersistentVolumeClaim/mirrorworker-mirror"} {
				if s3 && strings.HasPrefix(want, "PersistentVolumeClaim/") {
					if objs[want] != nil {
						t.Errorf("%s renders %s: an S3 target needs no shared volume", dir, want)
					}
					continue
				}
				if objs[want] == nil {
					t.Errorf("%s renders no %s", dir, want)
				}
			}
			d, ok := objs["Deployment/mirrorworker"].(*appsv1.Deployment)
			if !ok {
				t.Fatal("no Deployment")
			}
			checkDeployment(t, d)
			checkCredentialsMount(t, d)
			if s, ok := objs["Secret/mirrorworker-credentials"].(*corev1.Secret); ok && len(s.Data)+len(s.StringData) != 0 {
				t.Errorf("the base's credentials Secret holds %d keys, want none (it is filled out of band)", len(s.Data)+len(s.StringData))
			}
			if pvc, ok := objs["PersistentVolumeClaim/mirrorworker-mirror"].(*corev1.PersistentVolumeClaim); ok {
				if len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteMany {
					t.Errorf("mirror claim access modes %v, want ReadWriteMany", pvc.Spec.AccessModes)
				}
			}
			env := envOf(d.Spec.Template.Spec.Containers[0])
			if s3 {
				checkS3Overlay(t, d, env, objs)
			}
			if strings.HasSuffix(dir, "external-nats") {
				if env["MIRRORWORKER_STREAM_REPLICAS"] != "3" {
					t.Errorf("external-nats overlay: MIRRORWORKER_STREAM_REPLICAS %q, want 3", env["MIRRORWORKER_STREAM_REPLICAS"])
				}
				if env["MIRRORWORKER_NATS_CREDS"] == "" || !strings.Contains(env["MIRRORWORKER_NATS_URL"], ",") {
					t.Errorf("external-nats overlay: creds %q, url %q", env["MIRRORWORKER_NATS_CREDS"], env["MIRRORWORKER_NATS_URL"])
				}
			}
			if strings.Contains(dir, "overlays/") && d.Namespace == "" {
				t.Errorf("%s sets no namespace", dir)
			}
			if svc, ok := objs["Service/mirrorworker"].(*corev1.Service); ok {
				if len(svc.Spec.Selector) == 0 || svc.Spec.Ports[0].Port != 8081 {
					t.Errorf("service %+v", svc.Spec)
				}
				for k, v := range svc.Spec.Selector {
					if d.Spec.Template.Labels[k] != v {
						t.Errorf("service selector %s=%s does not select the pods (%v)", k, v, d.Spec.Template.Labels)
					}
				}
			}
		})
	}
}

// checkCredentialsMount: MIRRORWORKER_CREDENTIALS names the directory
// where the credentials Secret is mounted, read-only.
func checkCredentialsMount(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	path := envOf(c)["MIRRORWORKER_CREDENTIALS"]
	var vol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			if !m.ReadOnly {
				t.Errorf("credentials mounted writable at %s", path)
			}
			vol = m.Name
		}
	}
	found := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == vol && v.Secret != nil && v.Secret.SecretName == "mirrorworker-credentials" {
			found = true
		}
	}
	if path == "" || !found {
		t.Errorf("MIRRORWORKER_CREDENTIALS %q is not the mount of Secret mirrorworker-credentials (volume %q)", path, vol)
	}
}

// checkS3Overlay: the s3 overlay mounts no mirror volume, names a bucket
// target, and takes its credentials from a Secret that may be absent
// (IRSA), never from a literal.
func checkS3Overlay(t *testing.T, d *appsv1.Deployment, env map[string]string, objs map[string]any) {
	t.Helper()
	ps := d.Spec.Template.Spec
	for _, v := range ps.Volumes {
		if v.PersistentVolumeClaim != nil || v.Name == "mirror" {
			t.Errorf("s3 overlay keeps volume %s", v.Name)
		}
	}
	for _, m := range ps.Containers[0].VolumeMounts {
		if m.MountPath == "/mirror" {
			t.Errorf("s3 overlay keeps the mount %s", m.MountPath)
		}
	}
	if !strings.HasPrefix(env["MIRRORWORKER_TARGET"], "s3://") || env["MIRRORWORKER_S3_REGION"] == "" {
		t.Errorf("s3 overlay: target %q, region %q", env["MIRRORWORKER_TARGET"], env["MIRRORWORKER_S3_REGION"])
	}
	for _, e := range ps.Containers[0].Env {
		if strings.HasPrefix(e.Name, "AWS_") && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional) {
			t.Errorf("s3 overlay: %s must come from an optional Secret key (IRSA works without it)", e.Name)
		}
	}
	if objs["Secret/mirrorworker-s3"] == nil {
		t.Error("s3 overlay renders no Secret/mirrorworker-s3")
	}
}

func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", d.Spec.Replicas)
	}
	ps := d.Spec.Template.Spec
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers", len(ps.Containers))
	}
	c := ps.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v, want /healthz (never fails on a NATS outage)", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v, want /readyz", c.ReadinessProbe)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context %+v", sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	grace, err := time.ParseDuration(envOf(c)["MIRRORWORKER_SHUTDOWN_GRACE"])
	if err != nil {
		t.Errorf("MIRRORWORKER_SHUTDOWN_GRACE: %v", err)
	}
	if ps.TerminationGracePeriodSeconds == nil || time.Duration(*ps.TerminationGracePeriodSeconds)*time.Second <= grace+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v, want more than --shutdown-grace %s plus time to flush", ps.TerminationGracePeriodSeconds, grace)
	}
	if addr := envOf(c)["MIRRORWORKER_ADMIN_ADDR"]; !strings.HasPrefix(addr, ":") && !strings.HasPrefix(addr, "0.0.0.0:") {
		t.Errorf("MIRRORWORKER_ADMIN_ADDR %q is not reachable from the kubelet", addr)
	}
}

// TestImageNameMatchesMake: the kustomize base deploys the image `make
// image` builds: the same repository name, and the comment says how to set
// the tag make printed.
func TestImageNameMatchesMake(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var repo string
	for _, l := range strings.Split(string(mk), "\n") {
		if v, ok := strings.CutPrefix(l, "IMAGE_TAG"); ok {
			v = strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(v), "?:="))
			repo, _, _ = strings.Cut(v, ":")
		}
	}
	if repo == "" {
		t.Fatal("no IMAGE_TAG in the Makefile")
	}
	b, err := os.ReadFile(filepath.Join("kubernetes", "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Images []struct {
			Name    string `yaml:"name"`
			NewName string `yaml:"newName"`
			NewTag  string `yaml:"newTag"`
		} `yaml:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 || k.Images[0].NewName != repo || k.Images[0].Name != repo {
		t.Fatalf("kustomize images %+v, want %s (the Makefile's IMAGE_TAG)", k.Images, repo)
	}
	if !strings.Contains(string(b), "kustomize edit set image "+repo+"=") || !strings.Contains(string(b), "IMAGE_TAG="+repo+":"+k.Images[0].NewTag) {
		t.Errorf("kustomization.yaml does not say how to deploy what make image built, nor how to build the %s:%s it names", repo, k.Images[0].NewTag)
	}
}

// TestRunbooksPointTheRightWay: an origin that refuses every probe wants
// fewer requests: its runbook never says to lower a floor (more requests)
// and names the pause; the commands runbooks give exist.
func TestRunbooksPointTheRightWay(t *testing.T) {
	groups, errs := rulefmt.ParseFile(filepath.Join("prometheus", "mirrorworker-alerts.yml"), false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cmd := regexp.MustCompile("`mirrorworker ([a-z-]+)")
	known := map[string]bool{"run": true, "enqueue": true, "replay": true, "dlq": true, "pause": true, "resume": true, "status": true, "version": true}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rb := strings.Join(strings.Fields(r.Annotations["runbook"]), " ")
			if r.Alert == "MirrorworkerOriginCoolingLong" {
				if regexp.MustCompile(`(?i)\blower (its|the) floor\b`).MatchString(strings.ReplaceAll(rb, "never lower its floor", "")) {
					t.Errorf("%s: the runbook says to lower the floor, which sends more requests: %s", r.Alert, rb)
				}
				for _, want := range []string{"mirrorworker pause --authority", "never lower its floor", "raise its floor"} {
					if !strings.Contains(rb, want) {
						t.Errorf("%s: the runbook does not say %q", r.Alert, want)
					}
				}
			}
			for _, m := range cmd.FindAllStringSubmatch(rb, -1) {
				if !known[m[1]] {
					t.Errorf("%s: the runbook names 'mirrorworker %s', no such command", r.Alert, m[1])
				}
			}
		}
	}
}

// TestSystemdInstall: the unit's install commands create the directories
// they write into, and the credentials file reaches the dynamic user
// through LoadCredential, not a path it cannot read.
func TestSystemdInstall(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join("systemd", "mirrorworker.service"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(filepath.Join("systemd", "mirrorworker.env"))
	if err != nil {
		t.Fatal(err)
	}
	installs := 0
	for _, l := range strings.Split(string(unit), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(l, "#"))
		if strings.HasPrefix(l, "install ") {
			installs++
			if !strings.HasPrefix(l, "install -D ") {
				t.Errorf("%q fails when the directory does not exist: use install -D", l)
			}
		}
	}
	if installs < 3 {
		t.Errorf("the unit's header has %d install commands, want the binary, the unit and the env file", installs)
	}
	for _, want := range []string{"DynamicUser=yes", "LoadCredential=nats.creds:/etc/mirrorworker/nats.creds", "MIRRORWORKER_NATS_CREDS=%d/nats.creds"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit does not say %q", want)
		}
	}
	if strings.Contains(string(env), "MIRRORWORKER_NATS_CREDS=") {
		t.Error("mirrorworker.env sets a credentials path the dynamic user cannot read; it goes through LoadCredential")
	}
}
