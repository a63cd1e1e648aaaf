"""Added by ddtree-deploy's test series: its presence shows the `add` entry was deployed."""

DEPLOYED_BY = "ddtree-deploy test series"
