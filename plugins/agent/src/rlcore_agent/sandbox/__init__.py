"""Running model-written code: locally (:mod:`.local`), or through an HTTP service (:mod:`.server`,
:mod:`.client`) whose ``/run_code`` has the request and response shape of sandbox-fusion's."""
