"""`toolgym view`: a local web app over training runs (see `viewer/app.py`)."""
