"""What spans the ops we ship, above them: the ``kda-contracts`` command line's commands
(:mod:`.cli`), the demo tour (:mod:`.demo`) and the generated docs pages (:mod:`.docs`). The
engine never imports this package; an op never imports it either.
"""
