"""The console in Debian's Chromium driven by Playwright (`make test-browser`)."""
