package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadPointsAndColdTable(t *testing.T) {
	report := filepath.Join(t.TempDir(), "readybench.md")
	md := `# readybench

## Link 100mbit/10ms

| image | format | mode | runtime | cache | n | **total p50** | total p95 | lazy/full |
|---|---|---|---|---|---:|---:|---:|---:|
| gcc | gzip | full | podman4 | cold | 3 | **10.00** | 11.00 | - |
| gcc | estargz | lazy | podman4 | cold | 3 | **2.00** | 3.00 | 0.20 |
| gcc | estargz | lazy-stargz-store | podman4 | cold | 3 | **4.00** | 5.00 | 0.40 |
| gcc | estargz | lazy | podman4 | warm | 3 | **1.00** | 1.00 | 0.10 |

## Run time
`
	if err := os.WriteFile(report, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	links, byLink, err := readPoints(report)
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0] != "100mbit/10ms" || len(byLink[links[0]]) != 4 {
		t.Fatalf("links %q, points %+v", links, byLink)
	}
	c := coldOf(byLink[links[0]])
	// Two series measured (stargz-store, then layerstore), each p50, p50, p95 over the full pull.
	if got, want := c.table("podman4"), "gcc 0.400 0.400 0.500 0.200 0.200 0.300\n"; got != want {
		t.Errorf("table %q, want %q", got, want)
	}
	if got := c.table("podman5"); got != "" {
		t.Errorf("no podman5 cells, table %q", got)
	}
}

func TestReadPointsWithoutTables(t *testing.T) {
	report := filepath.Join(t.TempDir(), "readybench.md")
	if err := os.WriteFile(report, []byte("# readybench A/B\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readPoints(report); err == nil {
		t.Error("a report without a link's table read without error")
	}
}
