"""The names of a loss's terms, shared by the registry (torch-free) and the loss modules (`compo.losses.base`)."""

TOTAL = "loss"         # the plain sum of the weighted terms: what the trainer backpropagates
STAT_PREFIX = "stat_"  # a diagnostic entry: logged, detached, never part of the total
