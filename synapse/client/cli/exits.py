"""What synctl's exit codes mean: the root's help shows them, and the verbs exit with them."""

from __future__ import annotations

#: What each exit code means (docs/using/synctl.md; shown by `synctl --help`).
EXIT_CODES = """\b
Exit codes:
  0    success; with submit --wait or wait: the job SUCCEEDED
  1    the job ended FAILED or CANCELLED (submit --wait, wait)
  2    bad input or a refusal: an invalid job file, flag or --masters address (or a host that
       does not resolve), an unknown id; or a job that can never start (submit --wait, wait)
  3    cluster unreachable: every address refused connections for 1 s (before any master
       answered), or no master answered usefully within --timeout
  4    not authenticated: an unknown token, or TLS failed (unreadable --ca, a certificate that
       does not verify)
  5    permission denied: not your job, or an admin-only command
  130  interrupted (Ctrl-C); a job being followed goes on"""
EXIT_DENIED = 5
EXIT_INTERRUPTED = 130
