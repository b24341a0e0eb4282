"""What every layer may ask of the operating system: the machine's memory (``memory``), files written whole and
the folders runs and caches live in (``disk``), and child processes: a function run apart with limits, and a child
ended with everything it started (``processes``)."""
