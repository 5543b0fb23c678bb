"""Static checks of the deployment artefacts: compose files, Dockerfile, migration SQL, docs."""
