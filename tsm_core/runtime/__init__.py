"""The runtime layer every kernel family uses, and nothing family-specific: array
kinds (``arrays``), operand checks (``checks``), the CPU path (``cpu``), compile and
cache (``compile``, ``cache``), device facts (``device``), launching (``launch``),
the one timer (``timing``), the one tuner (``tune``), the ``TSM_*`` switches
(``config``) and logging (``log``). It imports no family."""
