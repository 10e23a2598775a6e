package mirror_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/mirrorworker/mirrorworker/mirror"
)

func ExampleFileTarget_Put() {
	dir, _ := os.MkdirTemp("", "mirror-example")
	defer os.RemoveAll(dir)
	target, err := mirror.Open("file://" + dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	m, err := target.Put(ctx, "files.example.org/hello.txt", strings.NewReader("hello\n"),
		mirror.Expect{Size: 6, HasSize: true},
		mirror.Meta{URL: "https://files.example.org/hello.txt", ETag: `"v1"`, JobID: "job-1"})
	fmt.Println(m.SHA256, m.Size, err)

	// The next fetch of this key is made conditional on the stored ETag.
	m, err = target.Stat(ctx, "files.example.org/hello.txt")
	fmt.Println(m.ETag, err)

	_, err = target.Stat(ctx, "files.example.org/other.txt")
	fmt.Println(err)
	// Output:
	// 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 6 <nil>
	// "v1" <nil>
	// stat "files.example.org/other.txt": mirror: not found
}
