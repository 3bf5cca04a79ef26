"""The one SQL job store: the state machine written once (``store``, ``submit``,
``records``) over a dialect per database (``dialect``); rows read back (``rows``)."""
