// Command auditrss measures the peak memory of `idem audit` reading hostile
// documents: for each named input it starts itself again, so that every
// input is read in a fresh process, builds the document in memory, calls
// audit.Parse on it and reports the process's peak resident memory
// (VmHWM, from /proc: Linux only) and how Parse answered.
//
//	go run ./internal/tools/auditrss             # every input, one process each
//	go run ./internal/tools/auditrss -one laughs # one input, in this process
//
// The inputs are the shapes the audit's bound tests refuse, some larger.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/idem-dev/idem/internal/audit"
)

const head = "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\npaths:\n  /orders:\n    post: {responses: {\"201\": {description: ok}}}\n"

const jsonHead = `{"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}, `

// inputs are the documents, by name, in the order they are reported.
var inputs = []struct {
	name string
	doc  func() string
}{
	{"list of tiny sequences (600,000 nodes)", func() string {
		return head + "x-junk:\n" + strings.Repeat("  - [a]\n", audit.DefaultMaxNodes/2)
	}},
	{"list of tiny sequences (32 MB)", func() string {
		return head + "x-junk:\n" + strings.Repeat("  - [a]\n", (audit.DefaultMaxBytes-200)/8)
	}},
	{"list of tiny sequences in UTF-16", func() string {
		var b strings.Builder
		b.WriteString("\xff\xfe")
		for _, u := range utf16.Encode([]rune(head + "x-junk:\n" + strings.Repeat("  - [a]\n", audit.DefaultMaxNodes/2))) {
			b.WriteByte(byte(u))
			b.WriteByte(byte(u >> 8))
		}
		return b.String()
	}},
	{"long flow sequence", func() string {
		return head + "x-junk: [" + strings.Repeat("a,", audit.DefaultMaxNodes) + "a]\n"
	}},
	{"billion laughs", func() string {
		s := ""
		for i := range 10 {
			if i == 0 {
				s += "x-a0: &a0 [" + strings.TrimSuffix(strings.Repeat("lol, ", 10), ", ") + "]\n"
				continue
			}
			p, n := "a"+strconv.Itoa(i-1), "a"+strconv.Itoa(i)
			s += "x-" + n + ": &" + n + " [" + strings.TrimSuffix(strings.Repeat("*"+p+", ", 10), ", ") + "]\n"
		}
		return head + s
	}},
	{"merge-key bomb", func() string {
		s := "x-m0: &m0 {" + strings.TrimSuffix(strings.Repeat("k: v, ", 1), ", ") + "}\n"
		for i := 1; i < 10; i++ {
			p, n := "m"+strconv.Itoa(i-1), "m"+strconv.Itoa(i)
			s += "x-" + n + ": &" + n + " {<<: [" + strings.TrimSuffix(strings.Repeat("*"+p+", ", 10), ", ") + "], k" + strconv.Itoa(i) + ": v}\n"
		}
		return head + s
	}},
	{"deep flow nesting (500)", func() string {
		return head + "x-deep: " + strings.Repeat("[", audit.DefaultMaxDepth) + strings.Repeat("]", audit.DefaultMaxDepth) + "\n"
	}},
	{"deep flow nesting (1,000,000)", func() string {
		return head + "x-deep: " + strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000) + "\n"
	}},
	{"deep block nesting (500)", func() string {
		return head + "x-deep:\n" + strings.Repeat("- ", audit.DefaultMaxDepth) + "a\n"
	}},
	{"deep block nesting (20,000)", func() string {
		return head + "x-deep:\n" + strings.Repeat("- ", 20_000) + "a\n"
	}},
	{"mapping of 10,000 keys", func() string {
		var b strings.Builder
		b.WriteString(head + "x-keys:\n")
		for i := range 10_000 {
			fmt.Fprintf(&b, "  k%06d: 1\n", i)
		}
		return b.String()
	}},
	{"JSON: many nodes", func() string {
		return jsonHead + `"x-junk": [` + strings.Repeat("[],", audit.DefaultMaxNodes) + `[]]}`
	}},
	{"JSON: deep", func() string {
		return jsonHead + `"x-deep": ` + strings.Repeat("[", audit.DefaultMaxDepth) + strings.Repeat("]", audit.DefaultMaxDepth) + `}`
	}},
	{"JSON: many keys", func() string {
		var b strings.Builder
		b.WriteString(jsonHead + `"x-keys": {`)
		for i := range 10_000 {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, `"k%d": 1`, i)
		}
		return b.String() + `}}`
	}},
	{"JSON that is YAML: many nodes", func() string {
		return `{openapi: 3.1.0, x-junk: [` + strings.Repeat("a,", audit.DefaultMaxNodes) + `a]}`
	}},
}

func main() {
	one := flag.String("one", "", "read this input in this process and print one line")
	flag.Parse()
	if *one != "" {
		i := slices.IndexFunc(inputs, func(in struct {
			name string
			doc  func() string
		}) bool {
			return in.name == *one
		})
		if i < 0 {
			log.Fatalf("no input %q", *one)
		}
		data := []byte(inputs[i].doc())
		_, err := audit.Parse(context.Background(), data, "hostile", audit.Options{})
		answer := "loaded"
		if err != nil {
			answer = err.Error()
			if len(answer) > 90 {
				answer = answer[:90] + "…"
			}
		}
		fmt.Printf("| %s | %d | %d | %s |\n", inputs[i].name, len(data), peakKB()/1024, answer)
		return
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("| input | bytes | peak RSS (MB) | answer |")
	fmt.Println("|---|---|---|---|")
	for _, in := range inputs {
		out, err := exec.Command(self, "-one", in.name).CombinedOutput()
		if err != nil {
			log.Fatalf("%s: %v\n%s", in.name, err, out)
		}
		os.Stdout.Write(out)
	}
}

// peakKB is the process's peak resident memory, VmHWM, in kB.
func peakKB() int {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		log.Fatal(err)
	}
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"))
			if err != nil {
				log.Fatal(err)
			}
			return kb
		}
	}
	log.Fatal("no VmHWM in /proc/self/status")
	return 0
}
