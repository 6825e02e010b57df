"""Operations on stored jobs: dead letters (list, show, replay, purge, audit), monitor checks, status."""
