// Command testsum turns `go test -json` into what `go test` prints without -v
// (the output of failing tests, and a line per package), and lists the tests
// that skipped with their reasons, which that output leaves out: appended to
// the file -skips names, or printed at the end. Lines that are not JSON (go
// test's own errors) pass through. scripts/gotest.sh runs it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	skipsFile := flag.String("skips", "", "append the skipped tests to this file instead of printing them at the end")
	flag.Parse()
	skips := summarize(os.Stdin, os.Stdout)
	if len(skips) == 0 {
		return
	}
	if *skipsFile == "" {
		fmt.Printf("\nskipped tests (%d):\n%s", len(skips), strings.Join(skips, ""))
		return
	}
	f, err := os.OpenFile(*skipsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(1)
	}
	defer f.Close()
	f.WriteString(strings.Join(skips, ""))
}

// summarize copies in's events to out as go test without -v would print them,
// and returns the skipped tests, one line each: package, test, reason.
func summarize(in io.Reader, out io.Writer) []string {
	held := map[string][]string{} // a running test's output, by package and name
	var skips []string
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text())
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "output" && e.Test != "":
			held[key] = append(held[key], e.Output)
		case e.Action == "output" || e.Action == "build-output":
			if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(out, e.Output)
			}
		case e.Test == "":
		case e.Action == "fail":
			// The verdict first, as go test prints it, then what the test logged.
			var verdict, logged []string
			for _, l := range held[key] {
				switch {
				case strings.HasPrefix(l, "--- "):
					verdict = append(verdict, l)
				case !strings.HasPrefix(l, "=== "):
					logged = append(logged, l)
				}
			}
			fmt.Fprint(out, strings.Join(append(verdict, logged...), ""))
			delete(held, key)
		case e.Action == "skip":
			skips = append(skips, fmt.Sprintf("  %s %s: %s\n", e.Package, e.Test, reason(held[key])))
			delete(held, key)
		case e.Action == "pass":
			delete(held, key)
		}
	}
	return skips
}

// reason is what a skipped test logged, on one line.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		r = append(r, l)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, " ")
}
