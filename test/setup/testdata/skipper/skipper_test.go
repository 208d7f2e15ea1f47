// Package skipper is a fixture of TestGotestSummary: a test that passes with a
// log line, one that skips, one that fails.
package skipper

import "testing"

func TestPasses(t *testing.T) { t.Log("a line only -v shows") }

func TestSkips(t *testing.T) { t.Skip("no widget on this machine") }

func TestFails(t *testing.T) { t.Error("the widget broke") }
