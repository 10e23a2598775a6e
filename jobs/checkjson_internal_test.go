package jobs

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// checkJSONCases are documents whose duplicate keys checkJSON must judge
// as the tokenizer does: duplicates at every depth, keys equal only once
// decoded, strings that look like structure, and objects past
// smallObject keys (looked up in a map).
func checkJSONCases() []string {
	many := func(n int, dup string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, "%q:%d,", fmt.Sprintf("k%d", i), i)
		}
		b.WriteString(dup + "}")
		return b.String()
	}
	return []string{
		`{"v":1,"id":"j4711","url":"http://127.0.0.1:40123/a5/4711","target":"a5/4711","tenant":"default","kind":"artifact"}`,
		`{"url":"http://h.example/x","url":"http://evil.example/y"}`,
		`{"url":"http://h.example/x","headers":{"Accept":"a","Accept":"b"}}`,
		`{"url":"http://h.example/x","x":[{"a":1,"a":2}]}`,
		`{"a":{"b":1},"b":{"a":1}}`,         // the same key at other depths
		`{"x":[{"a":1},{"a":2}],"a":3}`,     // in sibling objects
		`{"url":1,"\u0075rl":2}`,            // equal once decoded
		`{"\u00e9":1,"é":2}`,                // the same, not ASCII
		`{"a\"b":1,"a\"b":2}`,               // an escaped quote in a key
		`{"a\\":1,"a\\\\":2}`,               // a backslash, then two
		`{"a":"x,\"b\":1","b":2}`,           // a value that looks like a key
		`{"a":"}{[","a":"]"}`,               // brackets in strings
		`{"":1,"":2}`,                       // the empty key
		`{"":1," ":2}`,                      //
		`"{\"a\":1,\"a\":2}"`,               // a string document
		`[{"a":1,"b":[{"a":2,"a":3}]}]`,     // deep in an array
		`[[[[[[[[[[{"a":1,"a":1}]]]]]]]]]]`, // past the stack's first frames
		`{"a":[1,2,{"c":[]}],"b":null,"c":true,"a":false}`,
		`{"a" : 1 , "b" : { } , "a" : 2 }`, // white space
		`{"a":{"b":{"c":{}}},"d":{}}`,
		many(40, `"k3":1`),  // a duplicate of an early key found in the map
		many(40, `"k39":1`), // of a late one
		many(40, `"k40":1`), // none
		many(16, `"k0":1`),  // at the switch to a map
		many(15, `"k0":1`),
		`{"x":` + many(20, `"k1":1`) + `,"k1":2}`, // an inner map's keys are its own
		`{"k1":0,"x":` + many(20, `"y":1`) + `,"y":2}`,
		`{"a":1}{"a":2}`, // not valid JSON: both take the tokenizer
		`{"a":1,"a":2`,
	}
}

// TestCheckJSONAgreesWithTheTokenizer: the scan of well-formed JSON finds
// the duplicates the tokenizer finds, with the same message.
func TestCheckJSONAgreesWithTheTokenizer(t *testing.T) {
	for _, doc := range checkJSONCases() {
		got, want := checkJSON([]byte(doc)), checkJSONTokens([]byte(doc))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s:\n got %v\nwant %v", doc, got, want)
		}
	}
}

// FuzzCheckJSON compares checkJSON with the tokenizer on any input:
// go test -run '^$' -fuzz FuzzCheckJSON ./jobs/
func FuzzCheckJSON(f *testing.F) {
	for _, doc := range checkJSONCases() {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, want := checkJSON(data), checkJSONTokens(data)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q (valid %v):\n got %v\nwant %v", data, json.Valid(data), got, want)
		}
	})
}

// TestCheckingAJobAllocatesNothing: every job's duplicate check runs on
// the intake's path; a well-formed job whose keys have no escapes is
// checked without an allocation (the tokenizer made one per token, 89 for
// the throughput benchmark's job: ADR 0036, eighth pass).
func TestCheckingAJobAllocatesNothing(t *testing.T) {
	job := []byte(checkJSONCases()[0])
	if err := checkJSON(job); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { checkJSON(job) }); n != 0 {
		t.Errorf("checkJSON allocated %v times per job, want 0", n)
	}
}
