"""What a run leaves: the artifact folder and its manifest, and the reports (report.json, report.md,
junit.xml)."""
