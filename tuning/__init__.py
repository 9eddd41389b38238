"""specfleet's tuner (tune.py): the speculative settings and layouts a deployment may serve with
(candidates.py), the search that measures the fewest of them to find the best (search.py), and what it
writes back (SPECFLEET_SITE/tuned/<class>/<profile>.json, deployment/tuned.py)."""
