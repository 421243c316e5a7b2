package benchenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReportPath(t *testing.T) {
	want := filepath.Join("/m", "benchmarks", "results", time.Now().Format("2006-01-02")+"-lazybench", "lazybench.md")
	for _, c := range []struct{ out, want string }{{"", want}, {"-", ""}, {"x/r.md", "x/r.md"}} {
		if got := ReportPath("/m", "lazybench", c.out); got != c.want {
			t.Errorf("ReportPath(-out %q) = %q, want %q", c.out, got, c.want)
		}
	}
}

func TestWriteReportCreatesItsDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results", "r.md")
	if err := WriteReport(path, "# r\n"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "# r\n" {
		t.Fatalf("report file: %q, %v", b, err)
	}
	if err := WriteReport("", "# r\n"); err != nil {
		t.Fatalf("no file: %v", err)
	}
}

func TestHeader(t *testing.T) {
	h := Header("scalebench results", "scalebench", []string{"cores: 2"})
	for _, want := range []string{"# scalebench results\n", "Command: `cd benchmarks && go run ./cmd/scalebench", "\n- cores: 2\n", "- load average at the end: "} {
		if !strings.Contains(h, want) {
			t.Errorf("header lacks %q:\n%s", want, h)
		}
	}
}
