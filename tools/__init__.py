"""Tools beside the product, run from the checkout: they make and read the test fixtures and write the generated
docs, and never run in a deploy."""
