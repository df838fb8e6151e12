"""What measures the workflow (tools/README.md): the study's code in `compo` does not import this package."""
