package jobs_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

func ExampleParse() {
	j, err := jobs.Parse([]byte(`{"url":"https://Files.Example.org:8443/pub/","tenant":"acme"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(j.Target)
	fmt.Println(j.Subject())
	fmt.Println(j.ID)

	_, err = jobs.Parse([]byte(`{"url":"https://files.example.org/a/%2e%2e/%2e%2e/etc/passwd"}`))
	fmt.Println(err)
	// Output:
	// files.example.org_8443/pub/index
	// mirror.jobs.acme.files_example_org_8443
	// f8dec66fdec144241796102ffe2cdd85
	// target: the default "files.example.org/a/../../etc/passwd" derived from the url must not contain a ".." segment; give an explicit target
}

func ExamplePublish() {
	dir, err := os.MkdirTemp("", "jobs-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := e.Connect("example")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		log.Fatal(err)
	}
	for range 2 {
		ack, err := jobs.Publish(ctx, js, jobs.Job{URL: "https://files.example.org/a.tar.gz"})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ack.Sequence, ack.Duplicate)
	}
	// Output:
	// 1 false
	// 1 true
}
