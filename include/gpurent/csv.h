/* csv.h: one field of CSV (RFC 4180) as the billing team's spreadsheets
 * read it: the statements' CSV and `gpurentd report --format csv`. */
#ifndef GPURENT_CSV_H
#define GPURENT_CSV_H

#include <stdio.h>

/* Writes v to f as one field: quoted when it holds a comma, a quote or a
 * line break (quotes doubled). Text a spreadsheet would take for a formula
 * (starting with =, +, -, @, a tab or a carriage return, and not a number
 * such as -1.20) is written after a single quote, so that a name, a reason
 * or a payment id someone chose is shown, never run. */
void csv_field(FILE *f, const char *v);

#endif
