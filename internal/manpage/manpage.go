// Package manpage writes a manual page (man(7) roff) from the text a program
// prints as its help, so that the two never differ: each section's text is
// set as written, line for line.
package manpage

import (
	"fmt"
	"io"
	"strings"
)

// Section is one section of a page: a title (NAME, SYNOPSIS, ...) and its
// text, set as is.
type Section struct {
	Title, Text string
}

// Write writes the page of name in section (8, 5, ...), whose one-line
// summary is summary, with sections after NAME.
func Write(w io.Writer, name, section, summary string, sections ...Section) error {
	var b strings.Builder
	fmt.Fprintf(&b, ".TH %s %s \"\" smcr \"smcr\"\n", strings.ToUpper(name), section)
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", escape(name), escape(summary))
	for _, s := range sections {
		fmt.Fprintf(&b, ".SH %s\n.nf\n", s.Title)
		for _, l := range strings.Split(strings.TrimRight(s.Text, "\n"), "\n") {
			b.WriteString(escape(l) + "\n")
		}
		b.WriteString(".fi\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// escape makes line roff text: backslashes printed as such, and a line that
// would start with a control character (a dot, an apostrophe) starting with a
// zero-width one instead.
func escape(line string) string {
	line = strings.ReplaceAll(line, `\`, `\e`)
	if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
		line = `\&` + line
	}
	return line
}
