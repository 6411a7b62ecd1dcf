"""What a user types, checked before use: the ranges every number is held to (limits), the base of
every experiment-file section (sections), the command line's numbers (arguments), and the paths
and names a command is given (inputs). Each refusal is one line naming the key or the flag."""
