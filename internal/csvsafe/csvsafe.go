package csvsafe

import "strings"

// formulaStart are the first characters that make a spreadsheet read a
// cell as a formula (or, tab and carriage return, shift it into one).
const formulaStart = "=+-@\t\r"

// Cell is cell with a single quote before it if a spreadsheet would read
// it as a formula; otherwise cell.
func Cell(cell string) string {
	if cell != "" && strings.ContainsRune(formulaStart, rune(cell[0])) {
		return "'" + cell
	}
	return cell
}

// Row neutralises every cell of row (Cell), in place, and returns it.
func Row(row []string) []string {
	for i, cell := range row {
		row[i] = Cell(cell)
	}
	return row
}
