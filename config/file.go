package config

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// File is a configuration file's text together with the configuration it sets.
// Set edits the text the way a person would, so that what smcrctl set -P writes
// keeps the operator's comments, order and layout.
type File struct {
	Config Config
	text   []byte
}

// LoadFile reads and validates a configuration file, keeping its text.
func LoadFile(path string) (*File, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := parse(bytes.NewReader(text), path)
	if err != nil {
		return nil, err
	}
	return &File{Config: c, text: text}, nil
}

// Set applies attribute=value assignments, all or none as Config.Set does. The
// line that sets an attribute gets the new value in place, its indentation and
// comment kept; an attribute the file does not set is added at its end, with its
// description. Everything else stays as it was.
func (f *File) Set(assignments ...string) (*File, error) {
	n, err := f.Config.Set(assignments...)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitAfter(string(f.text), "\n")
	var added strings.Builder
	for _, a := range assignments {
		name, _, _ := strings.Cut(a, "=")
		name = strings.TrimSpace(name)
		value, _ := n.Get(name)
		if i := settingLine(lines, name); i >= 0 {
			lines[i] = withValue(lines[i], value)
			continue
		}
		attr, _ := attrByName(name)
		fmt.Fprintf(&added, "\n# %s\n%s = %s\n", attr.desc, name, value)
	}
	text := strings.Join(lines, "")
	if added.Len() > 0 && text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	text += added.String()
	// The edit must read back as what Set made; anything else is a bug here,
	// which must not reach the file.
	back, err := Parse(strings.NewReader(text))
	if err != nil || !bytes.Equal(back.Format(), n.Format()) {
		return nil, fmt.Errorf("config: set: the edited file would not read back as set (%v)", err)
	}
	return &File{Config: n, text: []byte(text)}, nil
}

// Text is the file's content.
func (f *File) Text() []byte { return bytes.Clone(f.text) }

// Save writes the file's text to path as Config.Save does (atomically, a symlink
// followed, mode and owner kept).
func (f *File) Save(path string) error {
	if err := save(path, f.text); err != nil {
		return fmt.Errorf("config: save: %w", err)
	}
	return nil
}

// settingLine is the index of the line that sets name, or -1. A file that loads
// sets each attribute at most once.
func settingLine(lines []string, name string) int {
	for i, l := range lines {
		if n, _, ok := strings.Cut(stripComment(l), "="); ok && strings.TrimSpace(n) == name {
			return i
		}
	}
	return -1
}

// withValue replaces the value on an attribute's line, keeping what surrounds it:
// "  rmb_size = 64K   # small" becomes "  rmb_size = 128K   # small".
func withValue(line, value string) string {
	eq := strings.IndexByte(line, '=')
	rest := line[eq+1:]
	// The value ends at a comment or at the line's end.
	end := strings.IndexByte(rest, '#')
	if end < 0 {
		end = len(strings.TrimRight(rest, "\r\n"))
	}
	old := rest[:end]
	lead := old[:len(old)-len(strings.TrimLeft(old, " \t"))]
	trail := old[len(strings.TrimRight(old, " \t")):]
	if strings.TrimSpace(old) == "" {
		trail = ""
	}
	if lead == "" {
		lead = " "
	}
	if strings.TrimSpace(old) == "" && end < len(rest) && rest[end] == '#' {
		trail = " " // "x =# c" set to a value: "x = v # c"
	}
	return line[:eq+1] + lead + value + trail + rest[end:]
}
