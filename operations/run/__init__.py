"""What opens and closes a deploy's run over every subject: preflight (everything that must hold before a host
is changed) and the summary table the run ends with."""
