"""Users' own pages under ``/account/`` (keys, usage, sign-up), also served to staff acting for a user."""
