"""Print, as JSON, when each trial of the study in OUT started and ended."""
import json
import sys
from pathlib import Path

import optuna

out = Path(sys.argv[1])
study = optuna.load_study(study_name="servetune", storage=f"sqlite:///{out / 'study.db'}")
rows = []
for t in study.trials:
    rows.append({"trial": t.number, "state": t.state.name, "role": t.user_attrs.get("role", "search"),
                 "start": t.datetime_start.isoformat() if t.datetime_start else None,
                 "end": t.datetime_complete.isoformat() if t.datetime_complete else None,
                 "value": t.value, "skipped": t.user_attrs.get("skipped")})
print(json.dumps(rows, indent=1))
