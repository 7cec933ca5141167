"""The /ui page's static files (index.html, app.js, style.css), served by proxy/api/ui.py."""
