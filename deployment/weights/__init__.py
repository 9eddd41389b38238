"""A deployment's weights: its repos, revisions and directories (config), and the run's fan-out plan of who
takes each file from whom (fanout)."""
