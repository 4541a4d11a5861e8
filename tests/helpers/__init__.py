"""What several test modules share (server repositories, clients of a served pipeline, the launcher),
kept out of the test modules themselves: importing a test module runs its module-level code again
under a second name and ties one module's tests to another's internals."""
