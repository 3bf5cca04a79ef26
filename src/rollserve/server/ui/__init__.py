"""The web viewer: a page served by rollserve itself at ``/ui`` (static assets written in the
project, no CDN), over the same HTTP API a trainer uses."""
