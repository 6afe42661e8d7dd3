"""The tour's report: figures and a self-contained HTML page, made only from the tour's JSON."""
