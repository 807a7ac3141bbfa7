"""After a run: what happened to the rewards, the report, the HTML page, the comparison of runs."""
