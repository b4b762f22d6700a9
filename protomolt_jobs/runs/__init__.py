"""What every door shares about a run: the submitter (a submission to a QUEUED row), the
scheduling fields and budget, the stored-run loader, the final report and the read-only
inspector views."""
