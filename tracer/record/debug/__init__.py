"""Debugging help inside a traced step: live breakpoints in the backward pass (breakpoints.py, the
tracer's side of the server's `/debug` namespace) and the problem finder (problems.py, with
forward_search.py and step_checks.py), which fills `StepTrace.problems`."""
