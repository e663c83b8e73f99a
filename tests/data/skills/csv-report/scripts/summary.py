"""Reads a CSV file and summarises its columns."""
import csv


def summarise(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    columns = list(rows[0].keys()) if rows else []
    ranges = {}
    for col in columns:
        try:
            values = [float(r[col]) for r in rows]
        except ValueError:
            continue
        ranges[col] = [min(values), max(values)]
    return {"rows": len(rows), "columns": columns, "ranges": ranges}
