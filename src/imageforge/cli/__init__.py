"""The `imageforge` command: its tasks, how a task is declared, its console entry, output and progress."""
