"""The ground floor: what every other part of the package may use, and which uses nothing of the package.

`errors.py` (UserError, the one exception for a user's mistake), `terminal.py` (text from outside shown
safely), `user_files.py` (the one reader of user YAML and untrusted files), `units.py` (the memory unit)
and `secrets.py` (keys, tokens and passwords kept out of every file and service).
"""
