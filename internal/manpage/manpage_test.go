package manpage

import (
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	var b strings.Builder
	if err := Write(&b, "smcrctl", "8", "the operator's command line", Section{"DESCRIPTION", "Usage: a\\b\n.hidden\n'quote\n"}); err != nil {
		t.Fatal(err)
	}
	want := ".TH SMCRCTL 8 \"\" smcr \"smcr\"\n.SH NAME\nsmcrctl \\- the operator's command line\n" +
		".SH DESCRIPTION\n.nf\nUsage: a\\eb\n\\&.hidden\n\\&'quote\n.fi\n"
	if b.String() != want {
		t.Errorf("page:\n%s\nwant:\n%s", b.String(), want)
	}
}
