// Package csvsafe neutralises the cells of a CSV row that a spreadsheet
// would run as a formula, for the exports of what anyone who can publish
// wrote: the audit log's ids, types, user ids, headers and errors
// (`meshctl audit export --format csv`, the console's CSV export).
//
// The rule is OWASP's (CSV injection): a cell that begins with =, +, -,
// @, a tab or a carriage return gets a single quote before it, which a
// spreadsheet shows and does not run. Every other cell is as it was. A
// cell so changed is no longer what was stored (a body of -1 becomes
// '-1): the JSON Lines export has it as it was.
//
//	w := csv.NewWriter(out)
//	w.Write(csvsafe.Row(ev.CSVRecord()))
package csvsafe
