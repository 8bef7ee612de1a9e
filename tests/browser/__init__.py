"""The web chat in a real browser: headless Chromium from Debian's ``chromium``
package, driven by Playwright for Python (``.ci/run`` installs it; without it
the tier is skipped), against live servers on tiny models."""
