"""Hosts whose SGLang runs in a container: the image build context (the series applied inside
the image by the host agent, as ``ddtree-deploy image`` writes it), the container program's
session on the host and what its answers mean. Imports the rooms below it (``base`` to
``serve``); ``fleets`` decides a container host's outcome, ``interop`` writes the context.
"""
