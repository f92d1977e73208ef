package csvsafe_test

import (
	"encoding/csv"
	"os"
	"testing"

	"github.com/meshkit/mesh/internal/csvsafe"
)

func TestCell(t *testing.T) {
	for cell, want := range map[string]string{
		`=HYPERLINK("http://evil.example","x")`: `'=HYPERLINK("http://evil.example","x")`,
		"+cmd|'/c calc'!A0":                     "'+cmd|'/c calc'!A0",
		"-2+3":                                  "'-2+3",
		"@SUM(A1)":                              "'@SUM(A1)",
		"\tnode":                                "'\tnode",
		"\rcause":                               "'\rcause",
		"":                                      "",
		"01JPLAIN":                              "01JPLAIN",
		"a=b":                                   "a=b",
		"'quoted":                               "'quoted",
		" =space first":                         " =space first",
	} {
		if got := csvsafe.Cell(cell); got != want {
			t.Errorf("Cell(%q) = %q, want %q", cell, got, want)
		}
	}
}

func ExampleRow() {
	w := csv.NewWriter(os.Stdout)
	_ = w.Write(csvsafe.Row([]string{"01JPLAIN", "=1+1", "-1", "shop"}))
	w.Flush()
	// Output: 01JPLAIN,'=1+1,'-1,shop
}
