"""A step outside the live page: one offline HTML file (`html`, from `data`) and the notebook display (`inline`)."""
