"""The shipped routing configs (YAML). A package only so that an installed tokenrouter finds them
(``tokenrouter.launch.paths.shipped_config``); nothing to import here."""
