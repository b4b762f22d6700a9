"""The jobs role's catalog actions (verbs), on one shared base."""
