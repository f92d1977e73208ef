package main

import (
	"fmt"
	"os"
	"text/tabwriter"
)

// figure is one ratio of the summary table, with its target.
type figure struct {
	name  string
	value float64
	// target is the bound, atLeast says whether value must reach it (a
	// throughput) or stay under it (CPU, latency, memory).
	target  float64
	atLeast bool
	unit    string // "" for a ratio
}

// summary collects the figures of a run, printed as one table at the end.
var summary []figure

// record adds a figure to the summary.
func record(name string, value, target float64, atLeast bool, unit string) {
	summary = append(summary, figure{name: name, value: value, target: target, atLeast: atLeast, unit: unit})
}

// pairedRatio is the median of num[i]/den[i]: each round measures both
// sides back to back, so a round in which the whole machine was slow
// (it is shared) moves both and leaves their ratio.
func pairedRatio(num, den []float64) float64 {
	r := make([]float64, min(len(num), len(den)))
	for i := range r {
		r[i] = num[i] / den[i]
	}
	return median(r)
}

// printSummary prints the table of figures beside their targets.
func printSummary() {
	if len(summary) == 0 {
		return
	}
	fmt.Println("\n== summary: each figure beside its target (issue 14); a ratio is the median of the rounds' ratios ==")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tTARGET\tMET")
	for _, f := range summary {
		cmp := "<="
		met := f.value <= f.target
		if f.atLeast {
			cmp, met = ">=", f.value >= f.target
		}
		verdict := "yes"
		if !met {
			verdict = "NO"
		}
		fmt.Fprintf(tw, "%s\t%.2f%s\t%s %.2f%s\t%s\n", f.name, f.value, f.unit, cmp, f.target, f.unit, verdict)
	}
	tw.Flush()
}
