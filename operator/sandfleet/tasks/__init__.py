"""Tasks as data: the catalogue (what a task is), the mutation operators and the factory that mines them."""
