"""``ddtree-deploy tune``: the sweep of DDTree's budget on a deployed host (pure search,
its run through the tune program, the picture, writing the winner into the inventory).
Imports the rooms below it (``base`` to ``session``).
"""
