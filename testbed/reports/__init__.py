"""Reports: what a run leaves for a reader. Its result files read back (results), figures (plots),
the HTML report (html) and the terminal's progress bar and summary table (progress). The live web
view is its own subpackage, testbed.watch. Reports import the layers below them (docs/design.md), never the
orchestration that writes the files they read."""
