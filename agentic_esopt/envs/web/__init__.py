"""Web agents in a real browser: BrowserGym episodes as text environments.

Importing this package needs nothing beyond the project's own requirements; the browser
stack (the ``web`` extra and Chromium) is checked, with the command that installs each
missing piece, when a browser pool is made.
"""
