"""What mechkit checks about a model before and after work: that its weights are whole and finite
(:mod:`.integrity`), and what identifies it for a resume key (:mod:`.identity`)."""
