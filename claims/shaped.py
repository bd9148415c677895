"""The names a shared diagnosis is computed under, and putting a claim's own names back.

Claims of one shape share one diagnosis (``claims.tasks.Shapes``), computed on a claim and a pod named by
the placeholders below; it is stored once (``claims.models.DiagnosisShape``) and each claim reads it with
its own claim name, uid and pod name put back (:func:`put_names`). Pure, no imports: the models and the
task both use it."""

# A name and uid no claim has, and a name no pod has.
SHAPE_NAME, SHAPE_UID = "claimscope-shape-5f0c2a9e", "claimscope-shape-uid-5f0c2a9e"
SHAPE_POD = "claimscope-shapepod-5f0c2a9e"
PLACEHOLDERS = (SHAPE_NAME, SHAPE_UID, SHAPE_POD)


def put_names(text: str, name: str, uid: str, pod_name: str, *, named: bool) -> str:
    """``text`` (a stored diagnosis, JSON or its summary) as a claim reads it: when ``named`` (the shape's
    flag: its text holds the placeholders), with them replaced by the claim's own names. A claim diagnosed
    alone is read as stored, even when its own names contain a placeholder. Names and uids are DNS labels
    and UUIDs: nothing to escape in JSON."""
    if not named or "claimscope-shape" not in text:  # the three's common prefix: most summaries have none
        return text
    return text.replace(SHAPE_NAME, name).replace(SHAPE_UID, uid).replace(SHAPE_POD, pod_name)
