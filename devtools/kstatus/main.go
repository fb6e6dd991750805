// kstatus: a TEST TOOL that computes a Kubernetes object's status with the kstatus library
// (sigs.k8s.io/cli-utils/pkg/kstatus), the code Flux's health checks run, so the tests hold
// CompiledModel's conditions to Flux's own reading rather than to a copy of its rules.
//
// Reads one object as JSON on stdin; prints {"status": "InProgress|Failed|Current|...", "message": ...}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	// The apimachinery decoder, as a client's: whole numbers stay int64 (generation).
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: decoding the object on stdin:", err)
		os.Exit(2)
	}
	res, err := status.Compute(obj)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
	out, err := json.Marshal(map[string]string{"status": res.Status.String(), "message": res.Message})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
